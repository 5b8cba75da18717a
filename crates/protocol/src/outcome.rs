//! Outcomes: the single terminal result of a call (docs/GOVERNANCE.md, "Outcomes").

use serde::{Deserialize, Serialize};

use crate::ids::{CallId, TurnId};
use crate::time::Timestamp;

/// How a call ended, with the fields each status carries.
///
/// Serialized flat into its [`Outcome`]: `{"status":"timeout","kind":"idle","after_ms":10000,...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// The tool ran and returned its own content.
    Ok,
    /// The tool or its transport failed.
    Error {
        /// What failed.
        reason: ErrorReason,
    },
    /// A deadline fired and the call was cancelled.
    Timeout {
        /// Which deadline.
        kind: TimeoutKind,
        /// The limit that was exceeded, in milliseconds.
        after_ms: u64,
    },
    /// The call was cancelled before it finished (or never started).
    Cancelled {
        /// Who or what cancelled it.
        reason: CancelReason,
    },
    /// The call was not allowed to run.
    Denied {
        /// What decided.
        decider: Decider,
        /// Why.
        reason: DenyReason,
        /// When the same call may be allowed, in milliseconds from now (a quota's denial).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
    /// The tool's circuit breaker is open; the call did not run.
    CircuitOpen {
        /// When a call may be admitted again, in milliseconds from now.
        retry_after_ms: u64,
    },
    /// The call was rejected before running: unknown tool, input failing its schema, too large.
    Invalid {
        /// What was wrong.
        reason: InvalidReason,
    },
    /// toolwarden stopped (crashed, was killed) while the call was running: recorded by the
    /// audit trail's recovery when toolwarden starts again. The call may have partly run.
    Interrupted,
}

/// What the audit's `status` filters take: every outcome status name, then `running` (calls
/// without an outcome yet).
pub const STATUS_FILTERS: &[&str] = &[
    "ok",
    "error",
    "timeout",
    "cancelled",
    "denied",
    "circuit_open",
    "invalid",
    "interrupted",
    "running",
];

/// Every outcome status name, as [`Status::name`] spells them.
pub const STATUS_NAMES: &[&str] = STATUS_FILTERS.split_at(STATUS_FILTERS.len() - 1).0;

impl Status {
    /// The status name as the wire spells it (`"ok"`, `"timeout"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error { .. } => "error",
            Status::Timeout { .. } => "timeout",
            Status::Cancelled { .. } => "cancelled",
            Status::Denied { .. } => "denied",
            Status::CircuitOpen { .. } => "circuit_open",
            Status::Invalid { .. } => "invalid",
            Status::Interrupted => "interrupted",
        }
    }

    /// Every status is an error to the model but `ok`.
    pub fn is_error(&self) -> bool {
        !matches!(self, Status::Ok)
    }
}

/// Why a call ended `error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// The tool ran and reported an error itself (`isError`, non-zero exit, a JSON-RPC error).
    ToolError,
    /// The connection to the backend failed.
    Transport,
    /// The backend process crashed or closed its pipe mid-call.
    Crashed,
    /// The backend was restarted (because another call was stuck) while this call ran.
    ServerRestart,
    /// The audit trail could not record the call's start (with `before_execution`) within
    /// `store.wait`: the call was not started.
    Store,
}

impl ErrorReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::ToolError => "tool_error",
            ErrorReason::Transport => "transport",
            ErrorReason::Crashed => "crashed",
            ErrorReason::ServerRestart => "server_restart",
            ErrorReason::Store => "store",
        }
    }
}

/// Which deadline fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutKind {
    /// The wall-clock cap of the whole call (`timeout`).
    Total,
    /// No heartbeat for `idle_timeout`.
    Idle,
    /// The cap of one attempt (`attempt_timeout`).
    Attempt,
}

impl TimeoutKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutKind::Total => "total",
            TimeoutKind::Idle => "idle",
            TimeoutKind::Attempt => "attempt",
        }
    }
}

/// Why a call (or turn) was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// A person or program asked for it (abort, Stop button, Ctrl-C).
    User,
    /// The client that asked for the call went away.
    ClientDisconnect,
    /// The parent turn was aborted.
    Parent,
    /// A deadline fired.
    Timeout,
    /// toolwarden is shutting down.
    Shutdown,
    /// The backend server was restarted.
    ServerRestart,
    /// The call never started: its turn was aborted before its backend was invoked.
    NotStarted,
}

impl CancelReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::User => "user",
            CancelReason::ClientDisconnect => "client_disconnect",
            CancelReason::Parent => "parent",
            CancelReason::Timeout => "timeout",
            CancelReason::Shutdown => "shutdown",
            CancelReason::ServerRestart => "server_restart",
            CancelReason::NotStarted => "not_started",
        }
    }
}

/// What decided a denial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// A mode of the session (e.g. read-only) forbids the tool.
    ModeGate,
    /// The tool's approval policy (`deny`, or an approval that was refused or timed out).
    Policy,
    /// The loop detector (identical calls repeated).
    LoopDetector,
    /// No interactor could answer and the request had no non-interactive default.
    Headless,
    /// A `[[rules]]` entry denied it.
    Rule,
    /// A `[hooks.NAME]` denied it, or failed with `on_error = "deny"`.
    Hook,
    /// A `[[quotas]]` entry had nothing left.
    Quota,
    /// Its tool's definition changed and `on_tool_change = "block"` holds it until accepted.
    Pin,
}

impl Decider {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Decider::ModeGate => "mode_gate",
            Decider::Policy => "policy",
            Decider::LoopDetector => "loop_detector",
            Decider::Headless => "headless",
            Decider::Rule => "rule",
            Decider::Hook => "hook",
            Decider::Quota => "quota",
            Decider::Pin => "pin",
        }
    }
}

/// Why a call was denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyReason {
    /// The interaction's deadline passed without an answer.
    Timeout,
    /// A person denied it.
    User,
    /// A configured rule (`approval = "deny"`).
    Rule,
    /// The loop detector's `block_after` was reached.
    Loop,
    /// Nothing attached could answer the interaction.
    NoInteractor,
    /// A hook failed (timed out, erred, answered garbage) and its `on_error` is `deny`.
    HookError,
    /// A quota's rate has no token left.
    RateLimit,
    /// A quota's concurrency cap is reached.
    Concurrency,
    /// The tool's definition changed since it was pinned.
    ToolChanged,
}

impl DenyReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Timeout => "timeout",
            DenyReason::User => "user",
            DenyReason::Rule => "rule",
            DenyReason::Loop => "loop",
            DenyReason::NoInteractor => "no_interactor",
            DenyReason::HookError => "hook_error",
            DenyReason::RateLimit => "rate_limit",
            DenyReason::Concurrency => "concurrency",
            DenyReason::ToolChanged => "tool_changed",
        }
    }
}

/// Why a call was rejected as invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidReason {
    /// No tool has that name.
    UnknownTool,
    /// The input does not match the tool's JSON schema.
    Schema,
    /// The input is larger than the limit.
    TooLarge,
}

impl InvalidReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidReason::UnknownTool => "unknown_tool",
            InvalidReason::Schema => "schema",
            InvalidReason::TooLarge => "too_large",
        }
    }
}

/// Where a result came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProvenanceSource {
    /// The tool ran for this call.
    Tool,
    /// Served from the cache (or shared with an identical call running at the same time).
    Cache,
}

/// A SHA-256 digest, written `sha256:` and 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentDigest(pub [u8; 32]);

impl std::fmt::Display for ContentDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut buf = [0u8; 7 + 64];
        buf[..7].copy_from_slice(b"sha256:");
        for (pair, &b) in buf[7..].chunks_exact_mut(2).zip(&self.0) {
            pair.copy_from_slice(&crate::hex::byte(b));
        }
        // Only ASCII was written.
        f.write_str(std::str::from_utf8(&buf).unwrap_or("sha256:?"))
    }
}

impl std::fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::str::FromStr for ContentDigest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64)
            .ok_or_else(|| format!("expected `sha256:` and 64 hex digits, got {s:?}"))?;
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(hi), Some(lo)) => out[i] = (hi * 16 + lo) as u8,
                _ => return Err(format!("expected `sha256:` and 64 hex digits, got {s:?}")),
            }
        }
        Ok(Self(out))
    }
}

impl Serialize for ContentDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ContentDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a result came from and when it was produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// Tool or cache.
    pub source: ProvenanceSource,
    /// When the tool produced the result (for a cache hit: the original time).
    pub fetched_at: Timestamp,
    /// Whether this result was served from the cache.
    pub cache_hit: bool,
    /// The SHA-256 of the result's canonical JSON content (`sha256:<hex>` in JSON).
    pub digest: ContentDigest,
    /// For a cache hit, the call that produced the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_call_id: Option<CallId>,
}

/// The structured form of a call's single terminal result (docs/GOVERNANCE.md, "Outcomes").
///
/// Front doors attach it as `_meta["toolwarden/outcome"]` (MCP) or the `toolwarden` field (HTTP).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The status and its fields, flattened.
    #[serde(flatten)]
    pub status: Status,
    /// How many attempts ran (0 when the call never reached its backend).
    pub attempts: u32,
    /// The call.
    pub call_id: CallId,
    /// Its turn.
    pub turn_id: TurnId,
    /// The tool's name as the caller used it (shared: every result of a tool names it).
    pub tool: std::sync::Arc<str>,
    /// From the call's arrival to its outcome, in milliseconds.
    pub duration_ms: u64,
    /// Where an `ok` result came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// A human-readable detail: the transport error, the schema violation, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Set by the loop detector when this call repeats an identical earlier call of the session:
    /// how many identical calls in a row gave this same result, this one included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_count: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn every_status_name_is_listed_once() {
        let all = [
            Status::Ok,
            Status::Error {
                reason: ErrorReason::ToolError,
            },
            Status::Timeout {
                kind: TimeoutKind::Total,
                after_ms: 1,
            },
            Status::Cancelled {
                reason: CancelReason::User,
            },
            Status::Denied {
                decider: Decider::Rule,
                reason: DenyReason::Rule,
                retry_after_ms: None,
            },
            Status::CircuitOpen { retry_after_ms: 1 },
            Status::Invalid {
                reason: InvalidReason::Schema,
            },
            Status::Interrupted,
        ];
        let names: Vec<&str> = all.iter().map(Status::name).collect();
        assert_eq!(names, STATUS_NAMES);
        assert_eq!(STATUS_FILTERS.last(), Some(&"running"));
    }

    #[test]
    fn outcome_serializes_flat_as_the_spec_shows() {
        let o = Outcome {
            status: Status::Timeout {
                kind: TimeoutKind::Idle,
                after_ms: 10_000,
            },
            attempts: 1,
            call_id: "c1".into(),
            turn_id: "t_1".into(),
            tool: "build".into(),
            duration_ms: 10_003,
            provenance: None,
            detail: None,
            repeat_count: None,
        };
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(
            v,
            json!({"status":"timeout","kind":"idle","after_ms":10000,"attempts":1,"call_id":"c1",
                   "turn_id":"t_1","tool":"build","duration_ms":10003})
        );
        let back: Outcome = serde_json::from_value(v).unwrap();
        assert_eq!(back, o);
    }

    /// Every reason's `as_str` is its serde name, so that metrics, texts and the wire agree.
    #[test]
    fn wire_names_are_the_serde_names() {
        fn check<T: Serialize>(values: &[T], name: impl Fn(&T) -> &'static str) {
            for v in values {
                assert_eq!(serde_json::to_value(v).unwrap(), json!(name(v)));
            }
        }
        use ErrorReason as E;
        check(
            &[
                E::ToolError,
                E::Transport,
                E::Crashed,
                E::ServerRestart,
                E::Store,
            ],
            |v| v.as_str(),
        );
        use TimeoutKind as T;
        check(&[T::Total, T::Idle, T::Attempt], |v| v.as_str());
        use CancelReason as C;
        check(
            &[
                C::User,
                C::ClientDisconnect,
                C::Parent,
                C::Timeout,
                C::Shutdown,
                C::ServerRestart,
                C::NotStarted,
            ],
            |v| v.as_str(),
        );
        use Decider as D;
        check(
            &[D::ModeGate, D::Policy, D::LoopDetector, D::Headless],
            |v| v.as_str(),
        );
        use DenyReason as R;
        check(
            &[R::Timeout, R::User, R::Rule, R::Loop, R::NoInteractor],
            |v| v.as_str(),
        );
        use InvalidReason as I;
        check(&[I::UnknownTool, I::Schema, I::TooLarge], |v| v.as_str());
    }
}

#[cfg(test)]
mod digest_tests {
    use super::ContentDigest;

    #[test]
    fn digests_read_back_what_they_write_and_refuse_anything_else() {
        let d = ContentDigest([0xab; 32]);
        let text = d.to_string();
        assert_eq!(text, format!("sha256:{}", "ab".repeat(32)));
        assert_eq!(text.parse::<ContentDigest>(), Ok(d));
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<ContentDigest>(&json).unwrap(), d);
        for bad in [
            "ab",
            "sha256:zz",
            "md5:00",
            &format!("sha256:{}", "g".repeat(64)),
        ] {
            assert!(bad.parse::<ContentDigest>().is_err(), "{bad}");
        }
    }
}
