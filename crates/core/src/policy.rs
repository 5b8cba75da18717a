//! Where a tool's effective policy comes from.
//!
//! The engine asks a [`PolicySource`] for the policy of every tool it registers. The config file
//! (`toolwarden_core::config`) is the usual source; [`BuiltinPolicies`] is the source of a bare
//! library engine: SPEC defaults, the tool's own in-code layer, then annotations.

use std::time::Duration;

use toolwarden_protocol::{Approval, Policy, PolicyConfig, ToolAnnotations};

/// Where a tool comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOrigin {
    /// An MCP server of the config.
    Server(String),
    /// The built-in `exec` tool.
    Exec,
    /// An in-process tool, with the policy its code set (applied like a server's layer: above
    /// `[defaults]`, below `[tools."NAME"]`).
    InProcess(Box<PolicyConfig>),
}

impl ToolOrigin {
    /// The backend's name for this origin (server name, `exec`, `inprocess`).
    pub fn backend_name(&self) -> &str {
        match self {
            ToolOrigin::Server(s) => s,
            ToolOrigin::Exec => "exec",
            ToolOrigin::InProcess(_) => "inprocess",
        }
    }
}

/// Resolves the effective policy of a tool.
pub trait PolicySource: Send + Sync + 'static {
    /// The policy of `tool` (its exposed name), before any per-call hint.
    fn policy(&self, tool: &str, origin: &ToolOrigin, annotations: &ToolAnnotations) -> Policy;
}

/// SPEC defaults, the in-code layer of in-process tools, then annotations.
#[derive(Clone, Debug, Default)]
pub struct BuiltinPolicies;

impl PolicySource for BuiltinPolicies {
    fn policy(&self, _tool: &str, origin: &ToolOrigin, annotations: &ToolAnnotations) -> Policy {
        let mut policy = Policy::default();
        let mut configured = Configured::default();
        if let ToolOrigin::InProcess(layer) = origin {
            overlay(&mut policy, layer, &mut configured);
        }
        apply_annotations(&mut policy, annotations, configured);
        clamp(&mut policy);
        policy
    }
}

/// Which annotation-fed keys some layer set explicitly (config wins over annotations).
#[derive(Clone, Copy, Debug, Default)]
pub struct Configured {
    /// `idempotent` was set.
    pub idempotent: bool,
    /// `approval` was set.
    pub approval: bool,
}

/// Applies one layer onto a policy, key by key. Negative values count as zero.
pub fn overlay(policy: &mut Policy, layer: &PolicyConfig, configured: &mut Configured) {
    let dur = |v: toolwarden_protocol::DurationValue| v.duration();
    let count = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    if let Some(v) = layer.timeout {
        policy.timeout = dur(v);
    }
    if let Some(v) = layer.idle_timeout {
        policy.idle_timeout = dur(v);
    }
    if let Some(v) = layer.attempt_timeout {
        policy.attempt_timeout = dur(v);
    }
    if let Some(v) = layer.max_timeout {
        policy.max_timeout = dur(v);
    }
    if let Some(v) = layer.cancel_grace {
        policy.cancel_grace = dur(v);
    }
    if let Some(v) = layer.retries {
        policy.retries = count(v);
    }
    if let Some(b) = &layer.backoff {
        if let Some(v) = b.initial {
            policy.backoff.initial = dur(v);
        }
        if let Some(v) = b.max {
            policy.backoff.max = dur(v);
        }
        if let Some(v) = b.multiplier {
            policy.backoff.multiplier = if v.is_finite() && v >= 1.0 { v } else { 1.0 };
        }
    }
    if let Some(v) = layer.idempotent {
        policy.idempotent = v;
        configured.idempotent = true;
    }
    if let Some(v) = layer.cache_ttl {
        policy.cache_ttl = dur(v);
    }
    if let Some(b) = &layer.breaker {
        if let Some(v) = b.failures {
            policy.breaker.failures = count(v);
        }
        if let Some(v) = b.window {
            policy.breaker.window = dur(v);
        }
        if let Some(v) = b.open_for {
            policy.breaker.open_for = dur(v);
        }
    }
    if let Some(v) = layer.concurrency {
        policy.concurrency = v;
    }
    if let Some(v) = layer.approval {
        policy.approval = v;
        configured.approval = true;
    }
    if let Some(v) = layer.approval_timeout {
        policy.approval_timeout = Some(dur(v));
    }
    if let Some(v) = layer.on_stuck {
        policy.on_stuck = v;
    }
    if let Some(l) = &layer.loop_ {
        if let Some(v) = l.warn_after {
            policy.loop_.warn_after = count(v);
        }
        if let Some(v) = l.block_after {
            policy.loop_.block_after = count(v);
        }
    }
    if let Some(v) = layer.retry_on_tool_error {
        policy.retry_on_tool_error = v;
    }
    if let Some(v) = layer.breaker_counts_tool_errors {
        policy.breaker_counts_tool_errors = v;
    }
    if let Some(v) = layer.max_input {
        policy.max_input = v.bytes();
    }
}

/// SPEC §2.2: explicit hints feed `idempotent` and `approval` unless a layer configured them.
pub fn apply_annotations(
    policy: &mut Policy,
    annotations: &ToolAnnotations,
    configured: Configured,
) {
    let read_only = annotations.read_only_hint == Some(true);
    if !configured.idempotent && (read_only || annotations.idempotent_hint == Some(true)) {
        policy.idempotent = true;
    }
    if !configured.approval && annotations.destructive_hint == Some(true) && !read_only {
        policy.approval = Approval::Confirm;
    }
}

/// SPEC §2.1 invariants: idle and attempt deadlines never exceed a total deadline.
pub fn clamp(policy: &mut Policy) {
    if !policy.timeout.is_zero() {
        policy.idle_timeout = policy.idle_timeout.min(policy.timeout);
        policy.attempt_timeout = policy.attempt_timeout.min(policy.timeout);
    }
}

/// A per-call hint: `timeout_ms` replaces `timeout`, clamped to `max_timeout`;
/// `idle_timeout_ms` replaces `idle_timeout`; then the invariants hold again.
pub fn apply_hints(
    policy: &Policy,
    timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
) -> Policy {
    let mut p = policy.clone();
    if let Some(ms) = timeout_ms {
        let asked = Duration::from_millis(ms);
        p.timeout = match (asked.is_zero(), p.max_timeout.is_zero()) {
            (_, true) => asked,
            (true, false) => p.max_timeout,
            (false, false) => asked.min(p.max_timeout),
        };
    }
    if let Some(ms) = idle_timeout_ms {
        p.idle_timeout = Duration::from_millis(ms);
    }
    clamp(&mut p);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwarden_protocol::DurationValue;

    #[test]
    fn hints_are_clamped_to_max_timeout() {
        let p = Policy {
            max_timeout: Duration::from_secs(60),
            ..Policy::default()
        };
        assert_eq!(
            apply_hints(&p, Some(5_000), None).timeout,
            Duration::from_secs(5)
        );
        assert_eq!(
            apply_hints(&p, Some(3_600_000), None).timeout,
            Duration::from_secs(60)
        );
        assert_eq!(
            apply_hints(&p, Some(0), None).timeout,
            Duration::from_secs(60),
            "no cap asked, ceiling kept"
        );
    }

    #[test]
    fn idle_is_clamped_to_the_total() {
        let p = Policy {
            idle_timeout: Duration::from_secs(30),
            ..Policy::default()
        };
        assert_eq!(
            apply_hints(&p, Some(10_000), None).idle_timeout,
            Duration::from_secs(10)
        );
    }

    #[test]
    fn annotations_fill_only_what_config_left_open() {
        let hints = ToolAnnotations {
            destructive_hint: Some(true),
            idempotent_hint: Some(true),
            ..Default::default()
        };
        let p = BuiltinPolicies.policy("t", &ToolOrigin::Server("s".into()), &hints);
        assert!(p.idempotent);
        assert_eq!(p.approval, Approval::Confirm);
        let layer = PolicyConfig {
            approval: Some(Approval::Auto),
            idempotent: Some(false),
            ..Default::default()
        };
        let p = BuiltinPolicies.policy("t", &ToolOrigin::InProcess(Box::new(layer)), &hints);
        assert!(!p.idempotent);
        assert_eq!(p.approval, Approval::Auto);
    }

    #[test]
    fn negative_layers_count_as_zero() {
        let layer = PolicyConfig {
            timeout: Some(DurationValue(-5_000)),
            retries: Some(-3),
            ..Default::default()
        };
        let p = BuiltinPolicies.policy(
            "t",
            &ToolOrigin::InProcess(Box::new(layer)),
            &ToolAnnotations::default(),
        );
        assert_eq!(p.timeout, Duration::ZERO);
        assert_eq!(p.retries, 0);
    }
}
