//! Recording a call's one outcome: its result goes into its slot, its turn's completion stream,
//! the session's memory, the tool's metrics and the `tool_result` event — exactly once, also
//! when the pipeline is dropped before it got there (a client that went away).

use std::sync::Arc;

use tokio::time::Instant;
use toolwarden_protocol::{
    CallId, CallResult, CallState, CancelReason, Content, Decider, DenyReason, ErrorReason,
    EventKind, LoopPolicy, Outcome, Provenance, ProvenanceSource, Status,
};

use crate::backend::ToolOutput;
use crate::cache::CachedResult;
use crate::canonical::{self, ValueRef};
use crate::events::EventScope;
use crate::loop_detect::LoopAnswer;
use crate::maps::CallDigest;
use crate::registry::ToolRuntime;
use crate::shared::{LOOP_RUN_TTL, SharedState};
use crate::text::{loop_note, outcome_text};

use super::env::CallEnv;
use super::slot::{CallSlot, CallTurn};

/// Records a call's single outcome — also when the pipeline is dropped before it got there. It
/// borrows the call's environment, turn and slot from the pipeline, which outlives it.
pub(super) struct Finisher<'a> {
    pub(super) env: &'a CallEnv,
    pub(super) turn: &'a CallTurn,
    pub(super) slot: &'a CallSlot,
    pub(super) scope: Arc<EventScope>,
    /// When the call arrived (its turn's start).
    pub(super) arrived: Instant,
    /// When its attempts ended, once they have: the moment its result is stamped with.
    pub(super) ended: Option<Instant>,
    pub(super) attempts: u32,
    /// Whether the backend was invoked (a cancel before reads `not_started`).
    pub(super) invoked: bool,
    /// Whether the call counts in the tool's in-flight gauge.
    pub(super) running: bool,
    /// The call's identity and loop policy, once it passed the loop detector: its answer
    /// counts into its session's run.
    pub(super) loop_key: Option<(CallDigest, LoopPolicy)>,
    /// The shared state, when the call's session is named and shares its loop run with the other
    /// replicas: the answer is counted there (see [`Finisher::count_shared`]).
    pub(super) shared_loop: Option<&'a dyn SharedState>,
    /// `(count, block_after)` when the loop detector saw this call repeat.
    repeat: Option<(u32, u32)>,
    pub(super) runtime: Option<&'a Arc<ToolRuntime>>,
    done: bool,
}

impl<'a> Finisher<'a> {
    /// The finisher of a call that arrived with its turn.
    pub(super) fn new(
        env: &'a CallEnv,
        turn: &'a CallTurn,
        slot: &'a CallSlot,
        runtime: Option<&'a Arc<ToolRuntime>>,
    ) -> Self {
        let scope = Arc::new(EventScope {
            principal: Some(turn.session.key.principal.clone()),
            session_id: Some(turn.session.key.id.clone()),
            turn_id: Some(turn.id.clone()),
            call_id: Some(slot.call_id.clone()),
            tool: Some(slot.tool.clone()),
        });
        Self {
            env,
            turn,
            slot,
            scope,
            arrived: turn.started,
            ended: None,
            attempts: 0,
            invoked: false,
            running: false,
            loop_key: None,
            shared_loop: None,
            repeat: None,
            runtime,
            done: false,
        }
    }

    fn tool(&self) -> &str {
        self.slot.tool.as_ref()
    }

    fn call_id(&self) -> &CallId {
        &self.slot.call_id
    }

    /// Records the outcome: the call's result goes to its turn (and to the `tool_result` event,
    /// sharing one allocation).
    pub(super) fn finish(
        &mut self,
        status: Status,
        detail: Option<String>,
        output: Option<ToolOutput>,
        provenance: Option<Provenance>,
    ) -> Arc<CallResult> {
        self.done = true;
        self.count_repeat(&status, output.as_ref(), provenance.as_ref());
        let is_error = status.is_error();
        let (mut content, structured_content) = match output {
            Some(out) if !out.content.is_empty() || out.structured_content.is_some() => {
                (out.content, out.structured_content)
            }
            _ => (
                vec![Content::text(outcome_text(
                    self.tool(),
                    &status,
                    detail.as_deref(),
                ))],
                None,
            ),
        };
        if let Some((count, block_after)) = self.repeat {
            content.push(Content::text(loop_note(self.tool(), count, block_after)));
        }
        let end = self.ended.unwrap_or_else(Instant::now);
        let elapsed = end.saturating_duration_since(self.arrived);
        let outcome = Outcome {
            status,
            attempts: self.attempts,
            call_id: self.call_id().clone(),
            turn_id: self.turn.id.clone(),
            tool: self.slot.tool.clone(),
            duration_ms: elapsed.as_millis() as u64,
            provenance,
            detail,
            repeat_count: self.repeat.map(|(c, _)| c),
        };
        let result = Arc::new(CallResult {
            outcome,
            content,
            structured_content,
            is_error,
        });
        if let Some(runtime) = &self.runtime {
            if self.running {
                runtime.metrics.in_flight(-1);
                self.running = false;
            }
            runtime
                .metrics
                .outcome(&result.outcome.status, elapsed.as_secs_f64());
        }
        {
            let mut view = self.slot.view.lock();
            view.state = CallState::Done;
            view.status = Some(result.outcome.status.name());
        }
        self.turn.session.record(&result.outcome);
        self.env.bus.emit_at(
            &self.scope,
            end,
            EventKind::ToolResult {
                result: result.clone(),
                duration_ms: result.outcome.duration_ms,
            },
        );
        self.turn.complete(self.slot, result.clone(), end);
        result
    }

    /// Counts the call's answer into its session's loop run; a repeat past `warn_after` is
    /// noted in its result. Only calls that reached their tool (or its cache) count: a result
    /// by its content's digest, a timeout or a cancel mid-way as an answer that ends the run.
    fn count_repeat(
        &mut self,
        status: &Status,
        output: Option<&ToolOutput>,
        provenance: Option<&Provenance>,
    ) {
        let Some((call, policy)) = &self.loop_key else {
            return;
        };
        let answer = match (status, output, provenance) {
            (Status::Ok, _, Some(p)) => LoopAnswer::Result(p.digest.0),
            (
                Status::Error {
                    reason: ErrorReason::ToolError,
                },
                Some(out),
                _,
            ) => LoopAnswer::Result(result_digest(out)),
            (
                Status::Error {
                    reason: ErrorReason::ToolError,
                },
                None,
                _,
            )
            | (Status::Timeout { .. } | Status::Cancelled { .. }, _, _)
                if self.invoked =>
            {
                LoopAnswer::Other
            }
            _ => return,
        };
        if let Some(count) = self.turn.session.loops.record(policy, call, answer) {
            self.repeat = Some((count, policy.block_after));
        }
    }

    /// Counts the call's answer into its session's run shared with the other replicas, before its
    /// outcome is recorded — so the session's next call sees it, on whichever replica it lands.
    /// This replica's run follows too (it decides while the shared state cannot be reached).
    /// `None`: an answer that leaves the run as it was.
    pub(super) async fn count_shared(&mut self, answer: Option<LoopAnswer>) {
        let Some(shared) = self.shared_loop.take() else {
            return;
        };
        let Some((call, policy)) = self.loop_key.take() else {
            return;
        };
        let Some(answer) = answer else {
            return;
        };
        let session = &self.turn.session;
        let local = session.loops.record(&policy, &call, answer);
        let result = match answer {
            LoopAnswer::Result(digest) => Some(digest),
            LoopAnswer::Other => None,
        };
        let count = match shared
            .loop_record(&session.key, &call.0, result, LOOP_RUN_TTL)
            .await
        {
            Some(n) => (policy.warn_after > 0 && n >= policy.warn_after).then_some(n),
            None => local,
        };
        if let Some(count) = count {
            self.repeat = Some((count, policy.block_after));
        }
    }

    /// Serves a stored result, counted first into the session's shared run when there is one.
    pub(super) async fn serve_hit(&mut self, hit: &CachedResult) {
        if self.shared_loop.is_some()
            && let Some(original) = &hit.result.outcome.provenance
        {
            let digest = original.digest.0;
            Box::pin(self.count_shared(Some(LoopAnswer::Result(digest)))).await;
        }
        self.cache_hit(hit);
    }

    pub(super) fn fail(&mut self, status: Status, detail: Option<String>) {
        self.finish(status, detail, None, None);
    }

    pub(super) fn deny(&mut self, decider: Decider, reason: DenyReason, detail: Option<String>) {
        self.env
            .bus
            .emit(&self.scope, EventKind::ToolCallDenied { decider, reason });
        self.fail(
            Status::Denied {
                decider,
                reason,
                retry_after_ms: None,
            },
            detail,
        )
    }

    /// Denied by a quota: like [`Finisher::deny`], with when to try again.
    pub(super) fn deny_until(
        &mut self,
        reason: DenyReason,
        retry_after_ms: u64,
        detail: Option<String>,
    ) {
        self.env.bus.emit(
            &self.scope,
            EventKind::ToolCallDenied {
                decider: Decider::Quota,
                reason,
            },
        );
        self.fail(
            Status::Denied {
                decider: Decider::Quota,
                reason,
                retry_after_ms: Some(retry_after_ms),
            },
            detail,
        )
    }

    /// Cancelled: `not_started` if the backend was never invoked, else the scope's reason.
    pub(super) fn cancelled(&mut self) {
        let reason = if self.invoked {
            self.slot
                .scope
                .reason()
                .unwrap_or(CancelReason::ClientDisconnect)
        } else {
            CancelReason::NotStarted
        };
        self.fail(Status::Cancelled { reason }, None);
    }

    pub(super) fn cache_hit(&mut self, hit: &CachedResult) {
        if let Some(runtime) = &self.runtime {
            runtime.metrics.cache_hit();
        }
        let Some(original) = hit.result.outcome.provenance.as_ref() else {
            // Only results with provenance are stored; be total anyway.
            return self.fail(
                Status::Error {
                    reason: ErrorReason::Transport,
                },
                Some("cache entry without provenance".into()),
            );
        };
        self.env.bus.emit(
            &self.scope,
            EventKind::CacheHit {
                origin_call_id: hit.origin_call_id().clone(),
                fetched_at: original.fetched_at,
            },
        );
        let provenance = Provenance {
            source: ProvenanceSource::Cache,
            fetched_at: original.fetched_at,
            cache_hit: true,
            digest: original.digest,
            origin_call_id: Some(hit.origin_call_id().clone()),
        };
        let output = ToolOutput {
            content: hit.content().to_vec(),
            structured_content: hit.result.structured_content.clone(),
            is_error: false,
        };
        self.finish(Status::Ok, None, Some(output), Some(provenance));
    }
}

impl Drop for Finisher<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled();
        }
    }
}

/// Digest of a result's content: canonical JSON of `{"content": [...], "structuredContent": ...}`.
pub(super) fn result_digest(output: &ToolOutput) -> [u8; 32] {
    let items = ValueRef::Contents(&output.content);
    match &output.structured_content {
        Some(s) => {
            canonical::digest_object(&[("content", items), ("structuredContent", ValueRef::One(s))])
        }
        None => canonical::digest_object(&[("content", items)]),
    }
}
