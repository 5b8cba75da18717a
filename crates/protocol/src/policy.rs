//! Policies: the config's optional layers ([`PolicyConfig`]) and the effective rules of one tool
//! ([`Policy`]) that the engine enforces (docs/CONFIG.md, "Policy keys").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::DurationValue;

/// `concurrency`: whether a call may run beside others of its session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrency {
    /// Runs in parallel with the session's other parallel calls.
    #[default]
    Parallel,
    /// Runs alone within its session.
    Exclusive,
}

/// `approval`: what must happen before a call runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Run without asking.
    #[default]
    Auto,
    /// Ask a human for approval first (an `approval` interaction).
    Ask,
    /// Ask a human to confirm a destructive call first (a `confirm` interaction).
    Confirm,
    /// Never run.
    Deny,
}

/// `on_stuck`: what to do when an MCP stdio server ignores a cancel past `cancel_grace`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStuck {
    /// Stop waiting; count the call as abandoned until its late answer arrives or the server exits.
    #[default]
    Abandon,
    /// Kill the server's process group and start it again.
    Restart,
}

/// `task`: whether a call may be answered with a task toward a client that supports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskMode {
    /// A task once the call has run `task_after` and is still running.
    #[default]
    Auto,
    /// A task at once.
    Always,
    /// Never a task: the request is held open until the result.
    Never,
}

/// `on_tool_change`: what happens when a server lists a tool whose definition differs from the
/// one pinned for its name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnToolChange {
    /// Recorded (`tool_changed`); the tool still runs.
    #[default]
    Warn,
    /// Its calls are denied until a person accepts the new definition.
    Block,
    /// The new definition is pinned at once (still recorded).
    Accept,
}

impl OnToolChange {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnToolChange::Warn => "warn",
            OnToolChange::Block => "block",
            OnToolChange::Accept => "accept",
        }
    }
}

/// `backoff` as written in the config.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    /// The first retry's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<DurationValue>,
    /// The cap of every retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<DurationValue>,
    /// Growth per retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
}

/// `breaker` as written in the config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    /// Failures within `window` that open the breaker; `0` = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<i64>,
    /// The counting window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationValue>,
    /// How long the breaker stays open before admitting one probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_for: Option<DurationValue>,
}

/// `loop` as written in the config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopConfig {
    /// From this many identical calls in a session on, results are annotated; `0` = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_after: Option<i64>,
    /// From this many identical calls in a session on, calls are denied; `0` = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_after: Option<i64>,
}

/// Defines a config struct that carries every policy key inline (so that `deny_unknown_fields`
/// works and the TOML parser reports unknown keys with their line), plus `policy()` to extract
/// them as a [`PolicyConfig`] layer.
#[macro_export]
#[doc(hidden)]
macro_rules! with_policy_keys {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $field:ident : $ty:ty,)* }) => {
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $field: $ty,)*
            /// Total wall-clock cap of a call; `0` = no cap.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub timeout: Option<$crate::DurationValue>,
            /// Cancel when no heartbeat arrived for this long; `0` = off.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub idle_timeout: Option<$crate::DurationValue>,
            /// Cap of one attempt; `0` = only `timeout` applies.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub attempt_timeout: Option<$crate::DurationValue>,
            /// Ceiling of a per-call `timeout_ms` hint.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub max_timeout: Option<$crate::DurationValue>,
            /// How long a backend gets to stop cooperatively before it is forced.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub cancel_grace: Option<$crate::DurationValue>,
            /// Extra attempts after a retryable failure (idempotent tools only).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub retries: Option<i64>,
            /// Backoff between attempts.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub backoff: Option<$crate::BackoffConfig>,
            /// May be retried and cached.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub idempotent: Option<bool>,
            /// Keep `ok` results of idempotent tools this long; `0` = off.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub cache_ttl: Option<$crate::DurationValue>,
            /// The per-tool circuit breaker.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub breaker: Option<$crate::BreakerConfig>,
            /// `parallel` or `exclusive` within the session.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub concurrency: Option<$crate::Concurrency>,
            /// `auto`, `ask`, `confirm` or `deny`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub approval: Option<$crate::Approval>,
            /// Deadline of the approval or confirm interaction.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub approval_timeout: Option<$crate::DurationValue>,
            /// `abandon` or `restart` a stdio server that ignores a cancel.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub on_stuck: Option<$crate::OnStuck>,
            /// The loop detector.
            #[serde(default, rename = "loop", skip_serializing_if = "Option::is_none")]
            pub loop_: Option<$crate::LoopConfig>,
            /// Retry a tool's own `isError` results too (idempotent tools only).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub retry_on_tool_error: Option<bool>,
            /// Let a tool's own `isError` results count as breaker failures.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub breaker_counts_tool_errors: Option<bool>,
            /// Largest accepted input (canonical JSON bytes).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub max_input: Option<$crate::SizeValue>,
            /// `auto`, `always` or `never`: answer with a task toward clients that support them.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub task: Option<$crate::TaskMode>,
            /// With `task = "auto"`: how long a call runs before it is answered with a task.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub task_after: Option<$crate::DurationValue>,
            /// `on_tool_change`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub on_tool_change: Option<$crate::OnToolChange>,
        }

        impl $name {
            /// The policy keys of this table, as one layer.
            pub fn policy(&self) -> $crate::PolicyConfig {
                $crate::PolicyConfig {
                    timeout: self.timeout,
                    idle_timeout: self.idle_timeout,
                    attempt_timeout: self.attempt_timeout,
                    max_timeout: self.max_timeout,
                    cancel_grace: self.cancel_grace,
                    retries: self.retries,
                    backoff: self.backoff.clone(),
                    idempotent: self.idempotent,
                    cache_ttl: self.cache_ttl,
                    breaker: self.breaker.clone(),
                    concurrency: self.concurrency,
                    approval: self.approval,
                    approval_timeout: self.approval_timeout,
                    on_stuck: self.on_stuck,
                    loop_: self.loop_.clone(),
                    retry_on_tool_error: self.retry_on_tool_error,
                    breaker_counts_tool_errors: self.breaker_counts_tool_errors,
                    max_input: self.max_input,
                    task: self.task,
                    task_after: self.task_after,
                    on_tool_change: self.on_tool_change,
                }
            }
        }
    };
}

with_policy_keys! {
    /// One layer of policy keys as written in `[defaults]`, `[servers.NAME]` or `[tools."NAME"]`.
    /// Every key is optional; later layers win key by key.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct PolicyConfig {}
}

/// The names of every policy key, as the config writes them.
pub const POLICY_KEYS: &[&str] = &[
    "timeout",
    "idle_timeout",
    "attempt_timeout",
    "max_timeout",
    "cancel_grace",
    "retries",
    "backoff",
    "idempotent",
    "cache_ttl",
    "breaker",
    "concurrency",
    "approval",
    "approval_timeout",
    "on_stuck",
    "loop",
    "retry_on_tool_error",
    "breaker_counts_tool_errors",
    "max_input",
    "task",
    "task_after",
    "on_tool_change",
];

/// Serializes a `Duration` the way the config writes it (`"30s"`).
mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::duration::{DurationValue, format_duration};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(DurationValue::deserialize(d)?.duration())
    }
}

/// Serializes an optional `Duration` the way the config writes it.
mod opt_duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::duration::{DurationValue, format_duration};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<DurationValue>::deserialize(d)?.map(DurationValue::duration))
    }
}

/// Effective backoff: sleep before retry `n` (0-based) = random(0, min(max, initial·multiplier^n)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    /// The first retry's cap.
    #[serde(with = "duration_str")]
    pub initial: Duration,
    /// The cap of every retry.
    #[serde(with = "duration_str")]
    pub max: Duration,
    /// Growth per retry.
    pub multiplier: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(5),
            multiplier: 2.0,
        }
    }
}

/// Effective circuit breaker settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    /// Failures within `window` that open it; `0` = off.
    pub failures: u32,
    /// The counting window.
    #[serde(with = "duration_str")]
    pub window: Duration,
    /// How long it stays open before one probe is admitted.
    #[serde(with = "duration_str")]
    pub open_for: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            failures: 5,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(30),
        }
    }
}

/// Effective loop detector settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopPolicy {
    /// Annotate from this many identical calls on; `0` = off.
    pub warn_after: u32,
    /// Deny from this many identical calls on; `0` = off.
    pub block_after: u32,
}

impl Default for LoopPolicy {
    fn default() -> Self {
        Self {
            warn_after: 3,
            block_after: 5,
        }
    }
}

/// The effective rules of one tool, every layer applied (the built-in defaults of docs/CONFIG.md
/// in `Default`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Total wall-clock cap; zero = none.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    /// Idle (heartbeat) cap; zero = off.
    #[serde(with = "duration_str")]
    pub idle_timeout: Duration,
    /// Per-attempt cap; zero = only `timeout`.
    #[serde(with = "duration_str")]
    pub attempt_timeout: Duration,
    /// Ceiling of a per-call hint.
    #[serde(with = "duration_str")]
    pub max_timeout: Duration,
    /// Cooperative-stop window before a backend is forced.
    #[serde(with = "duration_str")]
    pub cancel_grace: Duration,
    /// Extra attempts after a retryable failure.
    pub retries: u32,
    /// Backoff between attempts.
    pub backoff: Backoff,
    /// May be retried and cached.
    pub idempotent: bool,
    /// Cache lifetime of `ok` results; zero = off.
    #[serde(with = "duration_str")]
    pub cache_ttl: Duration,
    /// Circuit breaker.
    pub breaker: Breaker,
    /// Parallel or exclusive.
    pub concurrency: Concurrency,
    /// Approval mode.
    pub approval: Approval,
    /// Deadline of the approval (`ask`) or confirm interaction; `None` = the kind's default
    /// (approval 120s, confirm 60s).
    #[serde(
        default,
        with = "opt_duration_str",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_timeout: Option<Duration>,
    /// What to do with a stdio server that ignores a cancel.
    pub on_stuck: OnStuck,
    /// Loop detector.
    #[serde(rename = "loop")]
    pub loop_: LoopPolicy,
    /// Retry the tool's own error results.
    pub retry_on_tool_error: bool,
    /// Count the tool's own error results as breaker failures.
    pub breaker_counts_tool_errors: bool,
    /// Largest accepted input in bytes (canonical JSON).
    pub max_input: u64,
    /// Whether a call may become a task toward a client that supports them.
    pub task: TaskMode,
    /// With `task = "auto"`: how long a call runs before it becomes a task.
    #[serde(with = "duration_str")]
    pub task_after: Duration,
    /// What a change of the tool's definition does.
    #[serde(default)]
    pub on_tool_change: OnToolChange,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            idle_timeout: Duration::ZERO,
            attempt_timeout: Duration::ZERO,
            max_timeout: Duration::from_secs(30 * 60),
            cancel_grace: Duration::from_secs(2),
            retries: 0,
            backoff: Backoff::default(),
            idempotent: false,
            cache_ttl: Duration::ZERO,
            breaker: Breaker::default(),
            concurrency: Concurrency::Parallel,
            approval: Approval::Auto,
            approval_timeout: None,
            on_stuck: OnStuck::Abandon,
            loop_: LoopPolicy::default(),
            retry_on_tool_error: false,
            breaker_counts_tool_errors: false,
            max_input: 1 << 20,
            task: TaskMode::Auto,
            task_after: Duration::from_secs(10),
            on_tool_change: OnToolChange::Warn,
        }
    }
}
