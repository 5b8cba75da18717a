//! The approval gate: a call whose policy says `ask` or `confirm` waits for a person's answer,
//! under a finite deadline; a timeout is a denial by the clock (never read as a user's), and a
//! headless engine denies at once unless the request names a default.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use toolwarden_protocol::{
    Approval, CallState, Decider, DenyReason, InteractionAction, InteractionKind, Policy,
    format_duration,
};

use crate::interaction::{InteractionEnd, InteractionRequest};
use crate::registry::ToolEntry;
use crate::rules::Verdict;

use super::finish::Finisher;

/// Why a rule asks: its name and reason, for the question.
pub(super) fn rule_asks(v: &Verdict) -> String {
    match v.reason() {
        Some(reason) => format!("{}: {reason}", v.deciding()),
        None => format!("asked by {}", v.deciding()),
    }
}

/// Asks for approval; `false` when the call ended here (denied or cancelled). `why` names what
/// asks (rules, hooks), for the question.
pub(super) async fn approve(
    fin: &mut Finisher<'_>,
    entry: &ToolEntry,
    policy: &Policy,
    approval: Approval,
    why: Option<&str>,
    input: &Arc<Value>,
) -> bool {
    let kind = if approval == Approval::Confirm {
        InteractionKind::Confirm
    } else {
        InteractionKind::Approval
    };
    let timeout = policy.approval_timeout.unwrap_or(match kind {
        InteractionKind::Confirm => Duration::from_secs(60),
        _ => Duration::from_secs(120),
    });
    let message = match kind {
        InteractionKind::Confirm => format!(
            "Tool \"{}\" may be destructive. Run it with this input?",
            entry.name
        ),
        _ => format!("Allow tool \"{}\" to run with this input?", entry.name),
    };
    // A question a rule or a hook asks names it, and why.
    let message = match why {
        Some(why) => format!("{message} ({why})"),
        None => message,
    };
    let slot = fin.slot;
    slot.set_state(CallState::AwaitingApproval);
    let request = InteractionRequest {
        kind,
        message,
        scope: fin.scope.clone(),
        input: Some((**input).clone()),
        details: None,
        timeout,
        default_action: None,
    };
    let end = fin
        .env
        .interactions
        .ask(request, slot.scope.cancelled())
        .await;
    slot.set_state(CallState::Queued);
    match end {
        Ok(InteractionEnd::Answered(a)) if a.action == InteractionAction::Approve => return true,
        Ok(InteractionEnd::Defaulted(InteractionAction::Approve)) => return true,
        Ok(InteractionEnd::Answered(a)) => fin.deny(Decider::Policy, DenyReason::User, a.reason),
        Ok(InteractionEnd::TimedOut { after }) => fin.deny(
            Decider::Policy,
            DenyReason::Timeout,
            Some(format!("no answer within {}", format_duration(after))),
        ),
        Ok(InteractionEnd::NoInteractor | InteractionEnd::Defaulted(InteractionAction::Deny)) => {
            fin.deny(Decider::Headless, DenyReason::NoInteractor, None)
        }
        Ok(InteractionEnd::Cancelled) => fin.cancelled(),
        Err(e) => fin.deny(Decider::Policy, DenyReason::Rule, Some(e.to_string())),
    }
    false
}
