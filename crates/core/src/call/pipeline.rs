//! The pipeline of one call, step by step in the order `call`'s module doc gives. Each step that
//! ends the call records its outcome through the [`Finisher`] and returns; nothing after it runs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio::time::Instant;
use toolwarden_protocol::{
    Approval, CallState, Decider, DenyReason, ErrorReason, InvalidReason, Policy, Provenance,
    ProvenanceSource, Status, ToolCall,
};

use crate::availability::{PendingTool, Resolved};
use crate::breaker::{Admission, BreakerVerdict};
use crate::cache::CachedResult;
use crate::canonical;
use crate::config::apply_hints;
use crate::gate::Ticket;
use crate::loop_detect::LoopAnswer;
use crate::maps::CallDigest;
use crate::registry::{ToolEntry, ToolRuntime};
use crate::shared::{SharedState, lease_ttl};
use crate::text::human_size;

use super::across::{loop_blocks, pass_gate};
use super::approve::{approve, rule_asks};
use super::attempts::{Final, run_attempts};
use super::env::CallEnv;
use super::finish::{Finisher, result_digest};
use super::flight::lead_or_follow;
use super::guard::{Step, run_hooks, take_quotas};
use super::slot::{CallSlot, CallTurn};
use crate::policy::ToolOrigin;
use crate::rules::{Facts, Rules};
use toolwarden_protocol::{EventKind, Principal, RuleDecision};

/// What a call's name stands for when its turn is prepared.
pub(crate) enum Target {
    /// A registered tool.
    Known(Arc<ToolEntry>),
    /// A tool of a server that is not up yet: the call waits for it.
    Pending(Box<PendingTool>),
    /// No tool of that name; the suggestion names close ones.
    Unknown { suggestion: Option<String> },
}

/// One call of a turn, ready to run.
pub(crate) struct CallJob {
    pub(crate) slot: Arc<CallSlot>,
    pub(crate) call: ToolCall,
    pub(crate) target: Target,
    /// Its place in its session's line, reserved in call order when the turn was prepared.
    pub(crate) ticket: Option<Ticket>,
}

/// A half-open probe hands its slot back if the call ends without a verdict, and its lease
/// across replicas whichever way it ends.
struct ProbeGuard<'a> {
    runtime: &'a ToolRuntime,
    policy: &'a toolwarden_protocol::Breaker,
    admission: Admission,
    armed: bool,
    /// The shared state and the tool, when this probe holds the lease of every replica.
    lease: Option<(&'a dyn SharedState, &'a str)>,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.breaker.record(
                self.policy,
                self.admission,
                BreakerVerdict::Neutral,
                Instant::now(),
            );
        }
        if let Some((shared, tool)) = self.lease.take() {
            shared.probe_release(tool);
        }
    }
}

/// How long a call turned away while another replica probes should wait before trying again.
const PROBE_ELSEWHERE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs one call through the whole pipeline. Always returns (and records) exactly one result,
/// into the call's slot.
///
/// The job is taken apart here, before the pipeline's future is made: taken apart inside it, the
/// future would keep the job and its parts side by side.
pub(crate) fn run_call<'a>(
    env: &'a CallEnv,
    turn: &'a CallTurn,
    job: CallJob,
) -> impl Future<Output = ()> + 'a {
    let CallJob {
        slot,
        call,
        target,
        ticket,
    } = job;
    pipeline(env, turn, slot, call, target, ticket)
}

async fn pipeline(
    env: &CallEnv,
    turn: &CallTurn,
    slot: Arc<CallSlot>,
    call: ToolCall,
    target: Target,
    ticket: Option<Ticket>,
) {
    // A pending tool's entry, once its server listed it (declared before the finisher, which
    // borrows it).
    let mut listed: Option<Arc<ToolEntry>> = None;
    // Whether the call waited for its server to start (then the arrival is not "now").
    let mut waited = false;
    let known = match &target {
        Target::Known(entry) => Some(entry),
        Target::Pending(_) | Target::Unknown { .. } => None,
    };
    let mut fin = Finisher::new(env, turn, &slot, known.map(|e| &e.runtime));

    // Validate: a known tool (waiting for its server if need be), an input within size that
    // matches its schema.
    let unknown = |suggestion: Option<String>| {
        (
            Status::Invalid {
                reason: InvalidReason::UnknownTool,
            },
            suggestion,
        )
    };
    let entry: &Arc<ToolEntry> = match &target {
        Target::Known(entry) => entry,
        Target::Unknown { suggestion } => {
            let (status, detail) = unknown(suggestion.clone());
            return fin.fail(status, detail);
        }
        Target::Pending(pending) => {
            slot.set_state(CallState::Waiting);
            // Only the call's own hint bounds the wait besides `startup_timeout` (see
            // `availability`), clamped as the hint always is.
            let hint = call
                .timeout_ms
                .map(|_| apply_hints(&pending.policy, call.timeout_ms, None).timeout);
            match Box::pin(pending.resolve(&slot.scope, fin.arrived, hint)).await {
                Resolved::Tool(entry) => {
                    waited = true;
                    slot.set_state(CallState::Queued);
                    let entry = &*listed.insert(entry);
                    fin.runtime = Some(&entry.runtime);
                    entry
                }
                Resolved::Unknown(suggestion) => {
                    let (status, detail) = unknown(suggestion);
                    return fin.fail(status, detail);
                }
                Resolved::Down(detail) => {
                    return fin.fail(
                        Status::Error {
                            reason: ErrorReason::Transport,
                        },
                        Some(detail),
                    );
                }
                Resolved::Cancelled => return fin.cancelled(),
            }
        }
    };
    // The tool's policy, borrowed; one with the call's own deadline hints applied is made (and
    // boxed, to keep it out of every call's future) only for a call that gives hints.
    let hinted = (call.timeout_ms.is_some() || call.idle_timeout_ms.is_some()).then(|| {
        Box::new(apply_hints(
            &entry.policy,
            call.timeout_ms,
            call.idle_timeout_ms,
        ))
    });
    let policy: &Policy = hinted.as_deref().unwrap_or(&entry.policy);
    let input = match call.input {
        Value::Null => Value::Object(Default::default()),
        other => other,
    };
    let (input_len, call_digest) = canonical::measure_call(&entry.name, &input);
    let call_digest = CallDigest(call_digest);
    if input_len as u64 > policy.max_input {
        let detail = format!(
            "It is {}; the limit is {}.",
            human_size(input_len as u64),
            human_size(policy.max_input)
        );
        return fin.fail(
            Status::Invalid {
                reason: InvalidReason::TooLarge,
            },
            Some(detail),
        );
    }
    if let Some(validator) = &entry.validator
        && !validator.is_valid(&input)
    {
        let errors: Vec<String> = validator
            .iter_errors(&input)
            .take(5)
            .map(|e| {
                let path = e.instance_path().as_str();
                format!("{}: {e}", if path.is_empty() { "(input)" } else { path })
            })
            .collect();
        return fin.fail(
            Status::Invalid {
                reason: InvalidReason::Schema,
            },
            Some(errors.join("; ")),
        );
    }

    // A call whose turn was aborted (or whose engine shut down) before it got going goes no
    // further: it does not count as a repeat and nobody is asked to approve it.
    if slot.scope.is_cancelled() {
        return fin.cancelled();
    }

    // A tool whose server changed its definition, held until a person accepts the change.
    if env.pins.blocked(&entry.name) {
        let detail = env.pins.change(&entry.name).map(|c| {
            format!(
                "its definition changed from {} to {}; accept it with `toolwarden tools accept {}`",
                short(&c.old_digest),
                short(&c.new.digest),
                entry.name
            )
        });
        return fin.deny(Decider::Pin, DenyReason::ToolChanged, detail);
    }

    // Rules: whether the call may run at all, and whether a person must be asked, decided
    // before anything else runs. No rule matching leaves it to the tool's `approval`.
    let mut approval = policy.approval;
    let guards = env.guards.read().clone();
    let verdict = guards
        .rules
        .as_ref()
        .and_then(|rules| rule_verdict(rules, turn, entry, &input));
    if let Some(v) = &verdict {
        env.bus.emit(
            &fin.scope,
            EventKind::RuleDecision {
                decision: v.decision,
                rules: v.rules.iter().map(|m| m.index).collect(),
                reason: v.reason().map(str::to_owned),
            },
        );
        approval = match v.decision {
            RuleDecision::Allow => Approval::Auto,
            RuleDecision::Ask => Approval::Ask,
            RuleDecision::Confirm => Approval::Confirm,
            RuleDecision::Deny => {
                let detail = match v.reason() {
                    Some(reason) => format!("{reason} ({})", v.deciding()),
                    None => format!("denied by {}", v.deciding()),
                };
                return fin.deny(Decider::Rule, DenyReason::Rule, Some(detail));
            }
        };
    }

    // Hooks: asked in name order; the most restrictive of their decisions and the rules' wins,
    // and the arguments a hook rewrites are the call's from then on.
    let mut input = input;
    let mut call_digest = call_digest;
    // What asks a person, for the question: an asking rule, then asking hooks.
    let mut asking: Vec<String> = verdict
        .as_ref()
        .filter(|v| matches!(v.decision, RuleDecision::Ask | RuleDecision::Confirm))
        .map(rule_asks)
        .into_iter()
        .collect();
    if let Some(hooks) = &guards.hooks {
        // The deadline's start, as the attempts will count it (see `now` below).
        let since = if waited && call.timeout_ms.is_none() {
            Instant::now()
        } else {
            fin.arrived
        };
        match Box::pin(run_hooks(
            &mut fin, hooks, entry, policy, &mut input, approval, since,
        ))
        .await
        {
            Step::Go((decided, rewritten, hooks_asking)) => {
                approval = decided;
                asking.extend(hooks_asking);
                if rewritten {
                    call_digest = CallDigest(canonical::measure_call(&entry.name, &input).1);
                }
            }
            Step::Ended => return,
        }
    }

    // Loop detector: the call is denied when it would make `block_after` identical calls in a
    // row giving one result; otherwise its answer will count into the session's run. A named
    // session's run is the one every replica shares (its turns may reach any of them).
    let shared_session = env
        .shared
        .as_deref()
        .filter(|_| !turn.session.ephemeral.load(Ordering::Relaxed));
    let loop_on = policy.loop_.warn_after > 0 || policy.loop_.block_after > 0;
    let blocked = match shared_session {
        Some(shared) if loop_on => {
            Box::pin(loop_blocks(
                shared,
                &turn.session,
                &policy.loop_,
                &call_digest,
            ))
            .await
        }
        _ => turn.session.loops.blocks(&policy.loop_, &call_digest),
    };
    if let Some(count) = blocked {
        return fin.deny(
            Decider::LoopDetector,
            DenyReason::Loop,
            Some(format!(
                "the last {count} identical calls in a row gave the same result"
            )),
        );
    }
    fin.loop_key = Some((call_digest, policy.loop_));
    fin.shared_loop = shared_session.filter(|_| loop_on);
    let input = Arc::new(input);
    // The time now: the arrival until a step waits, read again after each wait (the wait for a
    // starting server above is one: the deadlines of a call that waited a minute for its
    // server start now, not a minute ago) — but for a call that gave its own deadline: its
    // client waits that long from the call's arrival, the wait included.
    let mut now = if waited && call.timeout_ms.is_none() {
        Instant::now()
    } else {
        fin.arrived
    };

    // Approval gate.
    match approval {
        Approval::Auto => {}
        Approval::Deny => return fin.deny(Decider::Policy, DenyReason::Rule, None),
        Approval::Ask | Approval::Confirm => {
            let why = (!asking.is_empty()).then(|| asking.join("; "));
            if !Box::pin(approve(
                &mut fin,
                entry,
                policy,
                approval,
                why.as_deref(),
                &input,
            ))
            .await
            {
                return;
            }
            now = Instant::now();
        }
    }

    // Quotas: a call allowed to run takes a token from each matching quota's bucket and a place
    // among its running calls (held until the call ends), or is turned away with when to try
    // again.
    let mut _quota_hold = None;
    if let Some(quotas) = &guards.quotas {
        match Box::pin(take_quotas(&mut fin, quotas, entry, policy)).await {
            Step::Go(hold) => _quota_hold = hold,
            Step::Ended => return,
        }
    }

    // Cache lookup (a hit is served even when the breaker is open), and single flight: share the
    // execution of an identical call that is running, or lead one. A leader must never wait for
    // its place in the session, because the calls holding earlier places may be its followers,
    // waiting for it: a call that has to wait at the gate only looks for a hit here and takes its
    // part in single flight past the gate. Any other call does both now, in one step.
    let cache_key = (policy.idempotent && !policy.cache_ttl.is_zero()).then_some(call_digest);
    // A named session's gate spans replicas once any tool is exclusive: such a call takes its
    // place there past its local place, as a call that waits does.
    let across = shared_session.filter(|_| {
        ticket
            .as_ref()
            .is_some_and(|t| t.exclusive() || env.exclusive_tools.load(Ordering::Relaxed))
    });
    let gate_free = across.is_none() && ticket.as_ref().is_none_or(Ticket::ready);
    let mut flight = None;
    let lock_ttl = lease_ttl(policy.timeout, policy.cancel_grace);
    if let Some(key) = &cache_key {
        if gate_free {
            match lead_or_follow(&mut fin, key, &mut now, lock_ttl).await {
                Some(guard) => flight = Some(guard),
                None => return,
            }
        } else if let Some(hit) = env.cache.hit(key, now) {
            return Box::pin(fin.serve_hit(&hit)).await;
        }
    }

    // Breaker. (A leader turned away here drops its guard: its followers look again.)
    let runtime = &entry.runtime;
    // Microseconds after arrival: the arrival instant is good enough for the breaker's clock.
    let (mut admission, change) = runtime.breaker.admit(&policy.breaker, now);
    env.breaker_changed(entry, &fin.scope, change, policy.breaker.open_for);
    // Across replicas, the one probe is the one holding the lease; a replica that does not get it
    // hands its local probe back and turns the call away as an open breaker would.
    let mut leased = None;
    if admission == Admission::Probe
        && let Some(shared) = &env.shared
    {
        let ttl = lease_ttl(policy.timeout, policy.cancel_grace);
        if Box::pin(shared.probe_lease(&entry.name, ttl)).await {
            leased = Some(shared);
        } else {
            runtime.breaker.record(
                &policy.breaker,
                admission,
                BreakerVerdict::Neutral,
                Instant::now(),
            );
            admission = Admission::Rejected {
                retry_after: PROBE_ELSEWHERE_RETRY.min(policy.breaker.open_for),
            };
        }
    }
    if let Admission::Rejected { retry_after } = admission {
        let retry_after_ms = retry_after.as_millis().max(1) as u64;
        return fin.fail(Status::CircuitOpen { retry_after_ms }, None);
    }
    let mut probe = ProbeGuard {
        runtime,
        policy: &policy.breaker,
        admission,
        armed: admission == Admission::Probe,
        lease: leased.map(|shared| (shared.as_ref(), &*entry.name)),
    };

    // Concurrency gate: the session's line here, then (for a named session with exclusive
    // tools, under Redis) its line across replicas.
    let mut held = None;
    if let Some(ticket) = &ticket
        && !gate_free
    {
        // The waits below are boxed: only calls that wait pay for their state, not every call's
        // future.
        if !ticket.ready() {
            slot.set_state(CallState::Waiting);
            let acquired = Box::pin(async {
                tokio::select! {
                    biased;
                    () = slot.scope.cancelled() => false,
                    () = ticket.acquire() => true,
                }
            })
            .await;
            if !acquired {
                return fin.cancelled();
            }
        }
        if let Some(shared) = across {
            let ttl = lease_ttl(policy.timeout, policy.cancel_grace);
            let passed = Box::pin(pass_gate(
                shared,
                &turn.session,
                ticket.exclusive(),
                ttl,
                &slot,
            ))
            .await;
            match passed {
                Some(hold) => held = hold,
                None => return fin.cancelled(),
            }
        }
        now = Instant::now();
        if let Some(key) = &cache_key {
            match lead_or_follow(&mut fin, key, &mut now, lock_ttl).await {
                Some(guard) => flight = Some(guard),
                None => return,
            }
        }
    }

    // A call cancelled while it passed the steps above (an approval answered as its turn was
    // aborted) never starts its backend either: the backend may act on the request at once.
    if slot.scope.is_cancelled() {
        return fin.cancelled();
    }

    // Attempts.
    let last = run_attempts(&mut fin, entry, policy, input, now).await;
    drop(held);
    drop(ticket);
    if fin.shared_loop.is_some() {
        let answer = match &last {
            Final::Ok(output) | Final::ToolError(output) => {
                Some(LoopAnswer::Result(result_digest(output)))
            }
            Final::Rejected(_) | Final::Timeout(..) | Final::Cancelled(_) if fin.invoked => {
                Some(LoopAnswer::Other)
            }
            _ => None,
        };
        Box::pin(fin.count_shared(answer)).await;
    }

    // Classify and record the breaker.
    let ended_at = Instant::now();
    fin.ended = Some(ended_at);
    let verdict = match &last {
        Final::Ok(_) | Final::Rejected(_) => BreakerVerdict::Success,
        Final::ToolError(_) if policy.breaker_counts_tool_errors => BreakerVerdict::Failure,
        Final::ToolError(_) => BreakerVerdict::Success,
        Final::Failed(ErrorReason::ServerRestart, _) => BreakerVerdict::Neutral,
        Final::Failed(..) | Final::Timeout(..) => BreakerVerdict::Failure,
        // A store that cannot write never trips a tool's breaker, nor does a server that cannot
        // start (its calls say why; an open breaker would hide it).
        Final::Cancelled(_) | Final::Unrecorded(_) | Final::Unavailable(_) => {
            BreakerVerdict::Neutral
        }
    };
    probe.armed = false;
    let change = runtime
        .breaker
        .record(&policy.breaker, admission, verdict, ended_at);
    env.breaker_changed(entry, &fin.scope, change, policy.breaker.open_for);
    drop(probe);

    // Cache store and outcome.
    match last {
        Final::Ok(output) => {
            let provenance = Provenance {
                source: ProvenanceSource::Tool,
                fetched_at: env.bus.stamp(ended_at),
                cache_hit: false,
                digest: toolwarden_protocol::ContentDigest(result_digest(&output)),
                origin_call_id: None,
            };
            let tool_blocks = output.content.len();
            let result = fin.finish(Status::Ok, None, Some(output), Some(provenance));
            if let Some(guard) = flight {
                guard.complete(
                    CachedResult {
                        result,
                        tool_blocks,
                    },
                    policy.cache_ttl,
                    ended_at,
                );
            }
        }
        Final::ToolError(output) => {
            fin.finish(
                Status::Error {
                    reason: ErrorReason::ToolError,
                },
                None,
                Some(output),
                None,
            );
        }
        Final::Rejected(message) => fin.fail(
            Status::Error {
                reason: ErrorReason::ToolError,
            },
            Some(message),
        ),
        Final::Failed(reason, message) => fin.fail(Status::Error { reason }, Some(message)),
        Final::Timeout(kind, limit) => fin.fail(
            Status::Timeout {
                kind,
                after_ms: limit.as_millis() as u64,
            },
            None,
        ),
        Final::Cancelled(reason) => fin.fail(Status::Cancelled { reason }, None),
        Final::Unrecorded(message) => fin.fail(
            Status::Error {
                reason: ErrorReason::Store,
            },
            Some(message),
        ),
        Final::Unavailable(message) => fin.fail(
            Status::Error {
                reason: ErrorReason::Transport,
            },
            Some(message),
        ),
    }
}

/// What `[[rules]]` say about a call of `entry` with `input` in `turn` (`None`: no rule matches).
fn rule_verdict(
    rules: &Rules,
    turn: &CallTurn,
    entry: &ToolEntry,
    input: &Value,
) -> Option<crate::rules::Verdict> {
    let principal = Principal::new(turn.session.key.principal.clone(), turn.scopes);
    let server = match &entry.origin {
        ToolOrigin::Server(server) => Some(server.as_str()),
        _ => None,
    };
    rules.decide(&Facts {
        tool: &entry.name,
        args: input,
        principal: &principal,
        session_id: Some(turn.session.key.id.as_str()),
        annotations: Some(&entry.spec.annotations),
        server,
    })
}

/// A digest as people compare them: `sha256:` and its first 12 hex digits.
fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}
