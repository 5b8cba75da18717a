//! Prometheus metrics (docs/GOVERNANCE.md, "Metrics").
//!
//! Per-tool handles are created once, when a tool is first used, and kept in its registry entry,
//! so the hot path touches atomics only — no label hashing, no allocation per call.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolwarden_protocol::{BreakerStateKind, InteractionKind, InteractionOutcome, Status};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolOutcome {
    tool: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolDecider {
    tool: String,
    decider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolReason {
    tool: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindOutcome {
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

/// Registers metric handles, one a line: `handle => "name", "help";` registers a clone of
/// `handle` on `$target` (a [`Registry`] or [`Metrics`]).
macro_rules! register_all {
    ($target:expr; $($handle:expr => $name:literal, $help:literal;)*) => {
        $($target.register($name, $help, $handle.clone());)*
    };
}
pub(crate) use register_all;

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 1 ms .. ~30 min.
    Histogram::new([
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
        300.0, 600.0, 1800.0,
    ])
}

/// Every metric of the engine.
pub struct Metrics {
    registry: Mutex<Registry>,
    calls: Family<ToolOutcome, Counter>,
    durations: HistogramFamily<ToolOutcome>,
    errors: Family<ToolReason, Counter>,
    denied: Family<ToolDecider, Counter>,
    cache_hits: Family<ToolLabel, Counter>,
    in_flight: Family<ToolLabel, Gauge>,
    abandoned: Family<ServerLabel, Gauge>,
    breaker: Family<ToolLabel, Gauge>,
    interactions: Family<KindOutcome, Counter>,
    turns: Family<OutcomeLabel, Counter>,
    /// `completed`, `partial`, `aborted`: counted on every turn, so kept at hand.
    turn_outcomes: [Counter; 3],
    server_up: Family<ServerLabel, Gauge>,
    /// Registered when state is shared with other replicas.
    shared: OnceLock<SharedMetrics>,
    /// Registered when hooks or quotas are configured.
    guards: OnceLock<GuardMetrics>,
}

/// The metrics of hooks and quotas: `toolwarden_hook_duration_seconds{hook}`,
/// `toolwarden_hook_failures_total{hook,reason}` and `toolwarden_quota_tokens{quota}`.
#[derive(Clone, Debug)]
pub struct GuardMetrics {
    hook_durations: HistogramFamily<HookLabel>,
    hook_failures: Family<HookReason, Counter>,
    quota_tokens: Family<QuotaLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabel {
    hook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookReason {
    hook: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabel {
    quota: String,
}

impl GuardMetrics {
    /// A hook answered (or failed: `failure` says how) after `seconds`.
    pub fn hook(&self, hook: &str, seconds: f64, failure: Option<&str>) {
        self.hook_durations
            .get_or_create(&HookLabel {
                hook: hook.to_owned(),
            })
            .observe(seconds);
        if let Some(reason) = failure {
            self.hook_failures
                .get_or_create(&HookReason {
                    hook: hook.to_owned(),
                    reason: reason.to_owned(),
                })
                .inc();
        }
    }

    /// The tokens left in quota `index`'s bucket that a call last took from.
    pub fn quota_tokens(&self, index: usize, tokens: f64) {
        self.quota_tokens
            .get_or_create(&QuotaLabel {
                quota: index.to_string(),
            })
            .set(tokens);
    }
}

/// The metrics of the state shared with other replicas (docs/SCALE-OUT.md):
/// `toolwarden_redis_up` (1 reached, 0 not) and `toolwarden_redis_fallbacks_total{op}`, every
/// operation that could not reach Redis and fell back to this replica's local state.
#[derive(Clone, Debug)]
pub struct SharedMetrics {
    up: Gauge,
    fallbacks: Family<OpLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: String,
}

impl SharedMetrics {
    /// Sets whether Redis is reached.
    pub fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }

    /// Counts one operation that fell back to local state.
    pub fn fallback(&self, op: &str) {
        self.fallbacks
            .get_or_create(&OpLabel { op: op.to_owned() })
            .inc();
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family under the `toolwarden_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("toolwarden");
        let calls = Family::<ToolOutcome, Counter>::default();
        let durations: HistogramFamily<ToolOutcome> =
            Family::new_with_constructor(duration_histogram);
        let errors = Family::<ToolReason, Counter>::default();
        let denied = Family::<ToolDecider, Counter>::default();
        let cache_hits = Family::<ToolLabel, Counter>::default();
        let in_flight = Family::<ToolLabel, Gauge>::default();
        let abandoned = Family::<ServerLabel, Gauge>::default();
        let breaker = Family::<ToolLabel, Gauge>::default();
        let interactions = Family::<KindOutcome, Counter>::default();
        let turns = Family::<OutcomeLabel, Counter>::default();
        let server_up = Family::<ServerLabel, Gauge>::default();
        register_all! { registry;
            calls => "tool_calls", "Calls by tool and outcome status";
            durations => "tool_call_duration_seconds", "Call duration from arrival to outcome, by tool and outcome status";
            errors => "tool_errors", "Calls that did not end ok, by tool and reason";
            denied => "denied", "Calls denied, by tool and by what decided (policy, rule, loop_detector, headless, mode_gate)";
            cache_hits => "tool_cache_hits", "Results served from the cache, by tool";
            in_flight => "tool_calls_in_flight", "Calls running now, by tool";
            abandoned => "abandoned_calls", "Calls whose backend ignored a cancel and could not be forced, by server";
            breaker => "breaker_state", "Circuit breaker state by tool: 0 closed, 1 half-open, 2 open";
            interactions => "interactions", "Interactions by kind and outcome";
            turns => "turns", "Turns by outcome";
            server_up => "server_up", "Whether an MCP server is up (1) or not (0)";
        }
        let turn_outcomes = ["completed", "partial", "aborted"].map(|o| {
            turns.get_or_create_owned(&OutcomeLabel {
                outcome: o.to_owned(),
            })
        });
        Self {
            registry: Mutex::new(registry),
            turn_outcomes,
            calls,
            durations,
            errors,
            denied,
            cache_hits,
            in_flight,
            abandoned,
            breaker,
            interactions,
            turns,
            server_up,
            shared: OnceLock::new(),
            guards: OnceLock::new(),
        }
    }

    /// The metrics of hooks and quotas, registered on first use.
    pub fn guards(&self) -> &GuardMetrics {
        self.guards.get_or_init(|| {
            let metrics = GuardMetrics {
                hook_durations: Family::new_with_constructor(|| {
                    Histogram::new([
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0,
                    ])
                }),
                hook_failures: Family::default(),
                quota_tokens: Family::default(),
            };
            register_all! { self;
                metrics.hook_durations => "hook_duration_seconds", "How long each hook took to answer (or to fail), by hook";
                metrics.hook_failures => "hook_failures", "Hooks that timed out, failed or answered garbage, by hook and reason";
                metrics.quota_tokens => "quota_tokens", "Tokens left in the bucket of each quota that a call last took from, by quota index";
            }
            metrics
        })
    }

    /// The metrics of shared state, registered on first use.
    pub fn shared(&self) -> &SharedMetrics {
        self.shared.get_or_init(|| {
            let metrics = SharedMetrics {
                up: Gauge::default(),
                fallbacks: Family::default(),
            };
            register_all! { self;
                metrics.up => "redis_up", "Whether Redis, which replicas share state through, is reached (1) or not (0)";
                metrics.fallbacks => "redis_fallbacks", "Operations that could not reach Redis and fell back to local state, by operation";
            }
            metrics
        })
    }

    /// Registers one more metric (under the `toolwarden_` prefix).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry.lock().register(name, help, metric);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// The handles of one tool.
    pub(crate) fn tool(self: &Arc<Self>, tool: &str) -> ToolMetrics {
        let label = ToolLabel {
            tool: tool.to_owned(),
        };
        ToolMetrics {
            tool: tool.to_owned(),
            metrics: self.clone(),
            by_status: Default::default(),
            cache_hits: self.cache_hits.get_or_create_owned(&label),
            in_flight: self.in_flight.get_or_create_owned(&label),
            breaker: self.breaker.get_or_create_owned(&label),
        }
    }

    /// Sets a server's abandoned-call count.
    pub fn set_abandoned(&self, server: &str, count: u64) {
        self.abandoned
            .get_or_create(&ServerLabel {
                server: server.to_owned(),
            })
            .set(count.min(i64::MAX as u64) as i64);
    }

    /// Sets whether a server is up.
    pub fn set_server_up(&self, server: &str, up: bool) {
        self.server_up
            .get_or_create(&ServerLabel {
                server: server.to_owned(),
            })
            .set(i64::from(up));
    }

    /// Counts an interaction's end.
    pub fn interaction(&self, kind: InteractionKind, outcome: InteractionOutcome) {
        self.interactions
            .get_or_create(&KindOutcome {
                kind: kind.as_str().to_owned(),
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts a turn's end.
    pub fn turn(&self, outcome: &str) {
        if let Some(i) = ["completed", "partial", "aborted"]
            .iter()
            .position(|o| *o == outcome)
        {
            self.turn_outcomes[i].inc();
            return;
        }
        self.turns
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

const STATUSES: usize = 8;

fn status_index(status: &Status) -> usize {
    match status {
        Status::Ok => 0,
        Status::Error { .. } => 1,
        Status::Timeout { .. } => 2,
        Status::Cancelled { .. } => 3,
        Status::Denied { .. } => 4,
        Status::CircuitOpen { .. } => 5,
        Status::Invalid { .. } => 6,
        Status::Interrupted => 7,
    }
}

/// The `reason` label of `toolwarden_tool_errors_total`: the error reason for `error`,
/// `timeout_<kind>` for timeouts, `cancelled_<reason>`, `denied_<reason>`, `invalid_<reason>`,
/// `circuit_open`.
fn error_reason(status: &Status) -> Option<String> {
    Some(match status {
        Status::Ok => return None,
        Status::Error { reason } => reason.as_str().to_owned(),
        Status::Timeout { kind, .. } => format!("timeout_{}", kind.as_str()),
        Status::Cancelled { reason } => format!("cancelled_{}", reason.as_str()),
        Status::Denied { reason, .. } => format!(
            "denied_{}",
            serde_json::to_value(reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        ),
        Status::Invalid { reason } => format!(
            "invalid_{}",
            serde_json::to_value(reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        ),
        Status::CircuitOpen { .. } => "circuit_open".to_owned(),
        Status::Interrupted => "interrupted".to_owned(),
    })
}

/// Metric handles of one tool.
pub(crate) struct ToolMetrics {
    tool: String,
    metrics: Arc<Metrics>,
    by_status: [OnceLock<(Counter, Histogram)>; STATUSES],
    cache_hits: Counter,
    in_flight: Gauge,
    breaker: Gauge,
}

impl ToolMetrics {
    /// Counts an outcome with its duration.
    pub(crate) fn outcome(&self, status: &Status, seconds: f64) {
        let (calls, histogram) = self.by_status[status_index(status)].get_or_init(|| {
            let labels = ToolOutcome {
                tool: self.tool.clone(),
                outcome: status.name().to_owned(),
            };
            (
                self.metrics.calls.get_or_create_owned(&labels),
                self.metrics.durations.get_or_create_owned(&labels),
            )
        });
        calls.inc();
        histogram.observe(seconds);
        if let Status::Denied { decider, .. } = status {
            self.metrics
                .denied
                .get_or_create(&ToolDecider {
                    tool: self.tool.clone(),
                    decider: decider.as_str().to_owned(),
                })
                .inc();
        }
        if let Some(reason) = error_reason(status) {
            self.metrics
                .errors
                .get_or_create(&ToolReason {
                    tool: self.tool.clone(),
                    reason,
                })
                .inc();
        }
    }

    pub(crate) fn cache_hit(&self) {
        self.cache_hits.inc();
    }

    pub(crate) fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    pub(crate) fn breaker(&self, state: BreakerStateKind) {
        self.breaker.set(match state {
            BreakerStateKind::Closed => 0,
            BreakerStateKind::HalfOpen => 1,
            BreakerStateKind::Open => 2,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwarden_protocol::{ErrorReason, TimeoutKind};

    #[test]
    fn exposes_the_spec_names() {
        let m = Arc::new(Metrics::new());
        let t = m.tool("build");
        t.outcome(&Status::Ok, 0.01);
        t.outcome(
            &Status::Timeout {
                kind: TimeoutKind::Idle,
                after_ms: 10,
            },
            0.01,
        );
        t.outcome(
            &Status::Error {
                reason: ErrorReason::Crashed,
            },
            0.01,
        );
        t.cache_hit();
        t.in_flight(1);
        t.breaker(BreakerStateKind::Open);
        m.set_abandoned("everything", 2);
        m.set_server_up("everything", true);
        m.interaction(InteractionKind::Approval, InteractionOutcome::TimedOut);
        m.turn("completed");
        let text = m.encode();
        for needle in [
            "toolwarden_tool_calls_total{tool=\"build\",outcome=\"ok\"} 1",
            "toolwarden_tool_call_duration_seconds_bucket{le=\"0.025\",tool=\"build\",outcome=\"timeout\"} 1",
            "toolwarden_tool_errors_total{tool=\"build\",reason=\"timeout_idle\"} 1",
            "toolwarden_tool_errors_total{tool=\"build\",reason=\"crashed\"} 1",
            "toolwarden_tool_cache_hits_total{tool=\"build\"} 1",
            "toolwarden_tool_calls_in_flight{tool=\"build\"} 1",
            "toolwarden_abandoned_calls{server=\"everything\"} 2",
            "toolwarden_breaker_state{tool=\"build\"} 2",
            "toolwarden_interactions_total{kind=\"approval\",outcome=\"timed_out\"} 1",
            "toolwarden_turns_total{outcome=\"completed\"} 1",
            "toolwarden_server_up{server=\"everything\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
