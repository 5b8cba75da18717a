//! Layering: from the config's optional keys to one tool's effective [`Policy`].

use std::time::Duration;

use toolwarden_protocol::{
    Approval, BackoffConfig, BreakerConfig, LoopConfig, Policy, PolicyConfig, ToolAnnotations,
};

/// The default deadline of an `approval` interaction (docs/GOVERNANCE.md, "Interactions").
pub(crate) const APPROVAL_DEFAULT: Duration = Duration::from_secs(120);
/// The default deadline of a `confirm` interaction (docs/GOVERNANCE.md, "Interactions").
pub(crate) const CONFIRM_DEFAULT: Duration = Duration::from_secs(60);

/// A signed count as the config writes it, as the policy holds it: negative → 0, and at most
/// `u32::MAX` (larger values are rejected when the config loads).
pub(crate) fn count(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

/// A multiplier as the policy holds it: finite and not negative.
pub(crate) fn multiplier(v: f64) -> f64 {
    if v.is_finite() { v.max(0.0) } else { 0.0 }
}

/// Writes every key `layer` sets over `policy`.
pub(crate) fn overlay(policy: &mut Policy, layer: &PolicyConfig) {
    let PolicyConfig {
        timeout,
        idle_timeout,
        attempt_timeout,
        max_timeout,
        cancel_grace,
        retries,
        backoff,
        idempotent,
        cache_ttl,
        breaker,
        concurrency,
        approval,
        approval_timeout,
        on_stuck,
        loop_,
        retry_on_tool_error,
        breaker_counts_tool_errors,
        max_input,
        task,
        task_after,
        on_tool_change,
    } = layer;
    let set = |slot: &mut Duration, v: &Option<toolwarden_protocol::DurationValue>| {
        if let Some(v) = v {
            *slot = v.duration();
        }
    };
    set(&mut policy.timeout, timeout);
    set(&mut policy.idle_timeout, idle_timeout);
    set(&mut policy.attempt_timeout, attempt_timeout);
    set(&mut policy.max_timeout, max_timeout);
    set(&mut policy.cancel_grace, cancel_grace);
    set(&mut policy.cache_ttl, cache_ttl);
    set(&mut policy.task_after, task_after);
    if let Some(v) = on_tool_change {
        policy.on_tool_change = *v;
    }
    if let Some(v) = retries {
        policy.retries = count(*v);
    }
    if let Some(BackoffConfig {
        initial,
        max,
        multiplier: m,
    }) = backoff
    {
        set(&mut policy.backoff.initial, initial);
        set(&mut policy.backoff.max, max);
        if let Some(m) = m {
            policy.backoff.multiplier = multiplier(*m);
        }
    }
    if let Some(v) = idempotent {
        policy.idempotent = *v;
    }
    if let Some(BreakerConfig {
        failures,
        window,
        open_for,
    }) = breaker
    {
        if let Some(v) = failures {
            policy.breaker.failures = count(*v);
        }
        set(&mut policy.breaker.window, window);
        set(&mut policy.breaker.open_for, open_for);
    }
    if let Some(v) = concurrency {
        policy.concurrency = *v;
    }
    if let Some(v) = approval {
        policy.approval = *v;
    }
    if let Some(v) = approval_timeout {
        policy.approval_timeout = Some(v.duration());
    }
    if let Some(v) = on_stuck {
        policy.on_stuck = *v;
    }
    if let Some(LoopConfig {
        warn_after,
        block_after,
    }) = loop_
    {
        if let Some(v) = warn_after {
            policy.loop_.warn_after = count(*v);
        }
        if let Some(v) = block_after {
            policy.loop_.block_after = count(*v);
        }
    }
    if let Some(v) = retry_on_tool_error {
        policy.retry_on_tool_error = *v;
    }
    if let Some(v) = breaker_counts_tool_errors {
        policy.breaker_counts_tool_errors = *v;
    }
    if let Some(v) = max_input {
        policy.max_input = v.bytes();
    }
    if let Some(v) = task {
        policy.task = *v;
    }
}

/// Layers `layers` (earliest first) over the built-in defaults, then fills from annotations what
/// no layer configured (docs/CONFIG.md, "Layering"), then applies the invariants.
pub(crate) fn resolve(
    layers: &[&PolicyConfig],
    annotations: &ToolAnnotations,
    ceiling: Duration,
) -> Policy {
    let mut policy = Policy::default();
    for layer in layers {
        overlay(&mut policy, layer);
    }
    // Only hints a server set explicitly count (`Some(true)`); config always wins.
    let read_only = annotations.read_only_hint == Some(true);
    if !layers.iter().any(|l| l.idempotent.is_some())
        && (read_only || annotations.idempotent_hint == Some(true))
    {
        policy.idempotent = true;
    }
    if !layers.iter().any(|l| l.approval.is_some())
        && annotations.destructive_hint == Some(true)
        && !read_only
    {
        policy.approval = Approval::Confirm;
    }
    clamp(&mut policy, ceiling);
    policy
}

/// The invariants on an effective policy (docs/CONFIG.md): idle and attempt timeouts at most the
/// total (when there is one); the approval or confirm deadline at most the interaction ceiling.
pub(crate) fn clamp(policy: &mut Policy, ceiling: Duration) {
    clamp_to_total(policy);
    let kind_default = match policy.approval {
        Approval::Ask => Some(APPROVAL_DEFAULT),
        Approval::Confirm => Some(CONFIRM_DEFAULT),
        Approval::Auto | Approval::Deny => None,
    };
    policy.approval_timeout = match (policy.approval_timeout, kind_default) {
        (Some(t), _) => Some(t.min(ceiling)),
        // The kind's default stays implicit unless the ceiling is below it.
        (None, Some(d)) if d > ceiling => Some(ceiling),
        (None, _) => None,
    };
}

fn clamp_to_total(policy: &mut Policy) {
    if !policy.timeout.is_zero() {
        policy.idle_timeout = policy.idle_timeout.min(policy.timeout);
        policy.attempt_timeout = policy.attempt_timeout.min(policy.timeout);
    }
}

/// Applies a call's own deadline hints to its effective policy (docs/GOVERNANCE.md, "Deadlines").
///
/// `timeout_ms` replaces `timeout`, clamped to `max_timeout` when that is above zero; a hint of
/// `0` asks for no cap, which `max_timeout` (when above zero) still caps. `idle_timeout_ms`
/// replaces `idle_timeout` (`0` = off), clamped to `max_timeout` likewise. Then the idle and
/// attempt timeouts are clamped to the total, when there is one.
pub fn apply_hints(
    policy: &Policy,
    timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
) -> Policy {
    let mut p = policy.clone();
    let max = p.max_timeout;
    let capped = |d: Duration| {
        if max.is_zero() || (!d.is_zero() && d <= max) {
            d
        } else {
            max
        }
    };
    if let Some(ms) = timeout_ms {
        p.timeout = capped(Duration::from_millis(ms));
    }
    if let Some(ms) = idle_timeout_ms {
        p.idle_timeout = match ms {
            0 => Duration::ZERO,
            ms => capped(Duration::from_millis(ms)),
        };
    }
    clamp_to_total(&mut p);
    p
}
