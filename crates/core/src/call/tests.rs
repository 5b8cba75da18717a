//! The pipeline on its own: a hand-made environment, turn and slot, a backend made for the test —
//! no engine around it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use toolwarden_protocol::{CancelReason, Event, Status, StopHow, ToolCall, ToolSpec, TurnId};

use crate::backend::{Attempt, AttemptEnd, Backend, BoxFuture, ToolOutput};
use crate::cache::Cache;
use crate::cancel::{CancelScope, ScopeKind};
use crate::config::Config;
use crate::events::EventBus;
use crate::interaction::Interactions;
use crate::metrics::Metrics;
use crate::policy::ToolOrigin;
use crate::registry::Registry;
use crate::retry::Jitter;
use crate::session::Session;

use super::{CallEnv, CallJob, CallSlot, CallTurn, Target, run_call};

/// Answers `"pong"` at once, or — for `{"hang": true}` — waits until asked to stop.
struct Pong;

impl Backend for Pong {
    fn name(&self) -> &str {
        "pong"
    }

    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd> {
        Box::pin(async move {
            if attempt.input["hang"] == json!(true) {
                attempt.stop.cancelled().await;
                return AttemptEnd::Stopped(StopHow::Cooperative);
            }
            AttemptEnd::Done(Ok(ToolOutput::text("pong")))
        })
    }
}

struct Kit {
    env: CallEnv,
    turn: CallTurn,
    registry: Registry,
    scope: CancelScope,
    events: crate::events::Matching,
}

fn kit() -> Kit {
    let bus = Arc::new(EventBus::new(64));
    let metrics = Arc::new(Metrics::new());
    let events = bus.subscribe_matching(|_| true);
    let env = CallEnv {
        bus: bus.clone(),
        cache: Cache::new(16),
        jitter: Jitter::new(Some(7)),
        tracker: TaskTracker::new(),
        interactions: Interactions::new(bus, metrics.clone(), Duration::from_secs(60)),
        store: None,
        shared: None,
        exclusive_tools: Default::default(),
        export_spans: false,
        guards: Default::default(),
        hook_transport: None,
        metrics: metrics.clone(),
        pins: Default::default(),
    };
    let registry = Registry::new(Arc::new(Config::builtin()), metrics);
    let root = CancelScope::root();
    let session = Arc::new(Session::new(
        toolwarden_protocol::SessionKey::local("s1"),
        root.child(ScopeKind::Session),
    ));
    let scope = session.scope.child(ScopeKind::Turn);
    let turn = CallTurn::new(TurnId::from("t1"), session, Instant::now(), None, None);
    Kit {
        env,
        turn,
        registry,
        scope,
        events,
    }
}

impl Kit {
    fn job(&self, name: &str, input: serde_json::Value) -> CallJob {
        let entry = self.registry.entry(
            "ping".into(),
            ToolSpec::new("ping", "Answers pong", json!({"type": "object"})),
            Arc::new(Pong),
            ToolOrigin::Server("test".into()),
        );
        let target = if name == "ping" {
            Target::Known(Arc::new(entry))
        } else {
            Target::Unknown {
                suggestion: Some("Did you mean \"ping\"?".into()),
            }
        };
        CallJob {
            slot: Arc::new(CallSlot::new(
                0,
                "c1".into(),
                name.into(),
                self.scope.clone(),
            )),
            call: ToolCall::new("c1", name, input),
            target,
            ticket: None,
        }
    }

    async fn types(&mut self, n: usize) -> Vec<&'static str> {
        let mut v = Vec::new();
        for _ in 0..n {
            let event: Arc<Event> = self.events.recv().await.expect("an event");
            v.push(event.kind.name());
        }
        v
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_writes_its_one_result_into_its_slot() {
    let mut kit = kit();
    let job = kit.job("ping", json!({}));
    let slot = job.slot.clone();
    run_call(&kit.env, &kit.turn, job).await;
    let (result, _) = slot.result.lock().clone().expect("a result in the slot");
    assert_eq!(result.outcome.status, Status::Ok);
    assert_eq!(result.text(), "pong");
    assert_eq!(kit.types(2).await, ["tool_start", "tool_result"]);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_tool_ends_invalid_with_the_suggestion() {
    let kit = kit();
    let job = kit.job("pnig", json!({}));
    let slot = job.slot.clone();
    run_call(&kit.env, &kit.turn, job).await;
    let (result, _) = slot.result.lock().clone().expect("a result in the slot");
    assert_eq!(
        result.outcome.detail.as_deref(),
        Some("Did you mean \"ping\"?")
    );
    assert!(result.text().starts_with("[INVALID]"), "{}", result.text());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_ends_the_call_at_once_and_the_stop_follows_behind() {
    let mut kit = kit();
    let job = kit.job("ping", json!({"hang": true}));
    let slot = job.slot.clone();
    let scope = kit.scope.clone();
    let canceller = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        scope.cancel(CancelReason::User);
    };
    tokio::join!(run_call(&kit.env, &kit.turn, job), canceller);
    let (result, _) = slot.result.lock().clone().expect("a result in the slot");
    assert_eq!(
        result.outcome.status,
        Status::Cancelled {
            reason: CancelReason::User
        }
    );
    kit.env.tracker.close();
    kit.env.tracker.wait().await;
    assert_eq!(
        kit.types(3).await,
        ["tool_start", "tool_result", "tool_stopped"]
    );
}
