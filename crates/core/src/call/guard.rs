//! The steps that decide, past the rules, whether a call may run: its hooks, then its quotas.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use toolwarden_protocol::{
    Approval, Decider, DenyReason, EventKind, Policy, RuleDecision, Status, TimeoutKind,
};

use crate::canonical;
use crate::hooks::{self, HookSet};
use crate::policy::ToolOrigin;
use crate::quotas::{QuotaFacts, QuotaHold, Quotas};
use crate::registry::ToolEntry;

use super::finish::Finisher;

/// Whether the call goes on past a step.
pub(super) enum Step<T> {
    Go(T),
    /// The step ended the call (its outcome is recorded).
    Ended,
}

/// The approval `decision` makes of `approval`: the more restrictive of the two.
pub(super) fn restrict(approval: Approval, decision: RuleDecision) -> Approval {
    let rank = |a: Approval| match a {
        Approval::Auto => 0,
        Approval::Ask => 1,
        Approval::Confirm => 2,
        Approval::Deny => 3,
    };
    let asked = match decision {
        RuleDecision::Allow => Approval::Auto,
        RuleDecision::Ask => Approval::Ask,
        RuleDecision::Confirm => Approval::Confirm,
        RuleDecision::Deny => Approval::Deny,
    };
    if rank(asked) > rank(approval) {
        asked
    } else {
        approval
    }
}

/// Asks each hook that names the call's tool, in name order, under the call's total deadline
/// (counted from `since`: the call's arrival, or the end of its wait for a starting server).
/// A denial (or a failure whose `on_error` denies) ends the call; `ask` makes the approval at
/// least `ask`; a hook's `args` replace the input for the next hooks and the call, once they
/// pass the tool's schema. Returns the approval, whether the input was rewritten, and why hooks
/// ask (for the question), if they do.
pub(super) async fn run_hooks(
    fin: &mut Finisher<'_>,
    hooks: &HookSet,
    entry: &ToolEntry,
    policy: &Policy,
    input: &mut Value,
    mut approval: Approval,
    since: Instant,
) -> Step<(Approval, bool, Vec<String>)> {
    let mut rewritten = false;
    let mut asking = Vec::new();
    // A call its approval denies anyway is not sent to anyone.
    if approval == Approval::Deny {
        return Step::Go((approval, false, asking));
    }
    for hook in hooks.for_tool(&entry.name) {
        // Under the call's total deadline, when it has one (`timeout = 0`: none).
        let bound = if policy.timeout.is_zero() {
            hook.timeout
        } else {
            let left = policy.timeout.saturating_sub(since.elapsed());
            if left.is_zero() {
                return total_timeout(fin, policy);
            }
            hook.timeout.min(left)
        };
        let body = request(fin, entry, input);
        let started = Instant::now();
        let asked = hooks::ask(fin.env.hook_transport.as_ref(), hook, body, bound);
        let answer = tokio::select! {
            biased;
            () = fin.slot.scope.cancelled() => return cancelled(fin),
            a = asked => a,
        };
        let took = started.elapsed();
        // A hook cut short by the call's deadline (not its own timeout) times the call out.
        if matches!(answer, Err(("timeout", _))) && bound < hook.timeout {
            // The call's deadline, not the hook, ran out: timed, not counted as its failure.
            fin.env
                .metrics
                .guards()
                .hook(&hook.name, took.as_secs_f64(), None);
            return total_timeout(fin, policy);
        }
        // Rewritten arguments must pass the tool's schema, or the answer is a failure.
        let answer = answer.and_then(|said| match (&said.args, &entry.validator) {
            (Some(args), _) if canonical::measure(args).0 as u64 > policy.max_input => Err((
                "bad_answer",
                format!(
                    "answered args larger than the tool's max_input ({})",
                    crate::text::human_size(policy.max_input)
                ),
            )),
            (Some(args), Some(validator)) if !validator.is_valid(args) => {
                let errors: Vec<String> = validator
                    .iter_errors(args)
                    .take(3)
                    .map(|e| e.to_string())
                    .collect();
                Err((
                    "bad_answer",
                    format!(
                        "answered args that do not match the tool's schema: {}",
                        errors.join("; ")
                    ),
                ))
            }
            _ => Ok(said),
        });
        let (decision, reason, failed, new_args) = match answer {
            Ok(said) => (said.decision, said.reason, None, said.args),
            Err((kind, message)) => (
                hooks::on_error_decision(hook.on_error),
                Some(message),
                Some(kind),
                None,
            ),
        };
        fin.env
            .metrics
            .guards()
            .hook(&hook.name, took.as_secs_f64(), failed);
        let changed = new_args.as_ref().is_some_and(|a| a != input);
        fin.env.bus.emit(
            &fin.scope,
            EventKind::HookDecision {
                hook: hook.name.clone(),
                decision,
                duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                rewritten: changed,
                reason: reason.clone(),
                failed: failed.is_some(),
                original_args: changed.then(|| input.clone()),
                args: if changed { new_args.clone() } else { None },
            },
        );
        if decision == RuleDecision::Deny {
            let (why, detail) = match (failed, reason) {
                (Some(_), Some(message)) => (
                    DenyReason::HookError,
                    format!("hook \"{}\" {message}", hook.name),
                ),
                (_, Some(reason)) => (
                    DenyReason::Rule,
                    format!("{reason} (hook \"{}\")", hook.name),
                ),
                (_, None) => (
                    DenyReason::Rule,
                    format!("denied by hook \"{}\"", hook.name),
                ),
            };
            fin.deny(Decider::Hook, why, Some(detail));
            return Step::Ended;
        }
        if decision == RuleDecision::Ask {
            asking.push(match (failed, &reason) {
                (Some(_), Some(message)) => format!("hook \"{}\" {message}", hook.name),
                (_, Some(reason)) => format!("hook \"{}\": {reason}", hook.name),
                (_, None) => format!("asked by hook \"{}\"", hook.name),
            });
        }
        approval = restrict(approval, decision);
        if changed && let Some(args) = new_args {
            *input = args;
            rewritten = true;
        }
    }
    Step::Go((approval, rewritten, asking))
}

/// The JSON a hook is sent about the call.
fn request(fin: &Finisher<'_>, entry: &ToolEntry, input: &Value) -> Vec<u8> {
    let turn = fin.turn;
    let server = match &entry.origin {
        ToolOrigin::Server(server) => Some(server.as_str()),
        _ => None,
    };
    let body = json!({
        "call_id": fin.slot.call_id,
        "turn_id": turn.id,
        "session_id": turn.session.key.id,
        "principal": turn.session.key.principal,
        "scopes": turn.scopes,
        "tool": &*entry.name,
        "server": server,
        "args": input,
        "annotations": entry.spec.annotations,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

fn total_timeout<T>(fin: &mut Finisher<'_>, policy: &Policy) -> Step<T> {
    fin.fail(
        Status::Timeout {
            kind: TimeoutKind::Total,
            after_ms: u64::try_from(policy.timeout.as_millis()).unwrap_or(u64::MAX),
        },
        None,
    );
    Step::Ended
}

fn cancelled<T>(fin: &mut Finisher<'_>) -> Step<T> {
    fin.cancelled();
    Step::Ended
}

/// Takes what the call needs from its quotas: the hold to keep while it runs, or the denial.
pub(super) async fn take_quotas(
    fin: &mut Finisher<'_>,
    quotas: &Arc<Quotas>,
    entry: &ToolEntry,
    policy: &Policy,
) -> Step<Option<QuotaHold>> {
    let turn = fin.turn;
    let session = format!("{}/{}", turn.session.key.principal, turn.session.key.id);
    let facts = QuotaFacts {
        tool: &entry.name,
        principal: &turn.session.key.principal,
        session: &session,
    };
    let lease = crate::shared::lease_ttl(policy.timeout, policy.cancel_grace);
    // Unique across replicas and turns (a call's own id is its client's, and repeats).
    let member = format!("{}/{}", turn.id, fin.slot.call_id);
    let taken = quotas
        .take(&facts, fin.env.shared.as_ref(), &member, lease)
        .await;
    for (index, tokens) in quotas.tokens() {
        fin.env.metrics.guards().quota_tokens(index, tokens);
    }
    match taken {
        Ok(hold) => Step::Go(hold),
        Err(refused) => {
            let retry_after_ms = millis(refused.retry_after);
            fin.env.bus.emit(
                &fin.scope,
                EventKind::QuotaExceeded {
                    quota: refused.quota,
                    reason: refused.reason,
                    bucket: refused.bucket.clone(),
                    retry_after_ms,
                },
            );
            fin.deny_until(refused.reason, retry_after_ms, Some(refused.what));
            Step::Ended
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
